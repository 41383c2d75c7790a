"""Pure derivations from measurements, shared by both processes: the crossover and its interval, fixed and per-FLOP
costs, and what to serve from a new sweep and the last served one (carry-over)."""
