"""The calibration corpus of the harness's checks (python -m tests.calibration; docs/calibration.md)."""
