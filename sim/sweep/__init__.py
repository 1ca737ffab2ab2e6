"""Sweeps and capacity planning: many simulations of one scenario, in parallel, with
confidence intervals over seeds."""
