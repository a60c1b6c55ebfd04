"""Held-out success along a schedule: a model of ES on binary-success tasks (docs/success.md).

Imports only ``staleness_sim.core``; a function of a trace and a seed, so it runs on a
simulated or a measured run alike.
"""
