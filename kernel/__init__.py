"""The shared kernel: errors, settings, logging, the vocabulary, the scenario model, loader
and traces, the latency sketch and the JSON codec. Imports nothing of headroom above it.
"""
