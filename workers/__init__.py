"""The ranking world, pure shedding policies, and the worker processes: ranking server, client,
precompute worker, feed.
"""
