"""The run driver: command line, start-up, the iteration loop, the training run.

The algorithm maths lives one level up (``trainers/<name>.py``); nothing here computes a loss.
"""
