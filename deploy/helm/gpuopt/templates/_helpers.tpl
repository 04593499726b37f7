{{/* Chart name. */}}
{{- define "gpuopt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless fullnameOverride. */}}
{{- define "gpuopt.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpuopt.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuopt.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuopt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpuopt.labels" -}}
helm.sh/chart: {{ include "gpuopt.chart" . }}
{{ include "gpuopt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "gpuopt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuopt.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpuopt.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The ConfigMap that holds the policy files. */}}
{{- define "gpuopt.policiesConfigMap" -}}
{{- default (printf "%s-policies" (include "gpuopt.fullname" .)) .Values.policies.existingConfigMap }}
{{- end }}

{{/* PostgreSQL (a database URL from a Secret) rather than SQLite in the data volume. */}}
{{- define "gpuopt.postgres" -}}
{{- if .Values.database.existingSecret }}true{{ end }}
{{- end }}

{{/* The api.public_url: publicUrl, else the Service's cluster DNS name. */}}
{{- define "gpuopt.publicUrl" -}}
{{- default (printf "http://%s.%s.svc:%v" (include "gpuopt.fullname" .) .Release.Namespace .Values.service.port) .Values.publicUrl }}
{{- end }}

{{/* Where the store is: the same for the daemon and its migration, so both open one database. */}}
{{- define "gpuopt.storeEnv" -}}
- name: GPUOPT_DATA_DIR
  value: /var/lib/gpuopt
- name: GPUOPT_CONFIG
  value: /etc/gpuopt/config/gpuopt.yaml
{{- if .Values.database.existingSecret }}
- name: GPUOPT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.key }}
{{- end }}
{{- end }}

{{/* Mounts the daemon and its migration share: data directory, config, a writable /tmp. */}}
{{- define "gpuopt.storeMounts" -}}
- name: data
  mountPath: /var/lib/gpuopt
- name: config
  mountPath: /etc/gpuopt/config
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}
