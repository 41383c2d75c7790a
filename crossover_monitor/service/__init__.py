"""The daemon's side: its life cycle, the schedule and the sweeps, the store of what is served, the run history."""
