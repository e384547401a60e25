"""Ray plumbing: placing worker groups and calling them with deadlines."""
