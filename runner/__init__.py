"""The real system: ES on a real causal LM, real terminal tasks in real Docker containers.

It drives the same scheduling-policy objects as :mod:`staleness_sim` and writes the same
trace format, so every simulated prediction can be checked against a measured run.
"""
