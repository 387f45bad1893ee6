"""DS2 autoscaler (issue 4): collect -> evaluate -> decide -> execute, with no Kubernetes import."""
