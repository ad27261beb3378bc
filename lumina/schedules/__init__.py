"""Masking schedules chosen by name (`LuminaConfig.masking_schedule`); one module per schedule."""

from lumina.schedules.base import DEFAULT_SCHEDULE, SCHEDULES, MaskingSchedule, build_schedule

__all__ = ["DEFAULT_SCHEDULE", "SCHEDULES", "MaskingSchedule", "build_schedule"]
