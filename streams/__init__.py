"""Kafka plumbing with no domain logic: topic registry, message schemas and validation, the orjson
codec, dead-letter routing, aiokafka helpers, record and replay, the local broker.
"""
