"""Schedules: where each Func of a block kernel is computed, and how its loops run."""

from .basic import schedule_basic

__all__ = ["schedule_basic"]
