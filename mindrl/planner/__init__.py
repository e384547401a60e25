"""Analytic planning: parameter counts by layout kind, per-device memory, sample flow."""
