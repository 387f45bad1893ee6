"""kopf operator for StreamJob resources (issue 5); run as `kopf run -m streamjobs_operator.main`."""
