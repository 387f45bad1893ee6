"""kopf operator for StreamJob resources; run as `kopf run -m streamjobs_operator.handlers`."""
