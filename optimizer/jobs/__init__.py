"""Managed jobs: the spec, the state machine and how reconcile applies it."""
