"""Virtual-time simulator: scenario traces, fleet model, policies and baselines, oracle. Pure cores
only, never Kafka.
"""
