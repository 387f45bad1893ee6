{{- define "streamjobs.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "streamjobs.labels" -}}
app.kubernetes.io/part-of: streamjobs
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "streamjobs.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "streamjobs.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "streamjobs.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s-redis.%s.svc:6379" (include "streamjobs.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- .Values.redis.url -}}
{{- end -}}
{{- end -}}

{{/* The Secret whose key `password` the operator logs in to the default Redis with (empty: none). */}}
{{- define "streamjobs.redisPasswordSecret" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.auth.existingSecret | default (printf "%s-redis-auth" (include "streamjobs.fullname" .)) -}}
{{- else -}}
{{- .Values.redis.passwordSecret -}}
{{- end -}}
{{- end -}}

{{/* Pods run as an unprivileged user with a read-only root filesystem. */}}
{{- define "streamjobs.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "streamjobs.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}
