{{/*
Names, labels and the Secrets the pods read. Every template takes its names
from here so a nameOverride changes them all together.
*/}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.fullname" -}}
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

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the database URL, and its key. */}}
{{- define "switchyard.databaseSecret" -}}
{{- .Values.database.existingSecret | default (include "switchyard.fullname" .) }}
{{- end }}
{{- define "switchyard.databaseSecretKey" -}}
{{- if .Values.database.existingSecret }}{{ .Values.database.existingSecretKey }}{{ else }}database-url{{ end }}
{{- end }}

{{/* Whether the pods get a tokens file, and the Secret and key holding it. */}}
{{- define "switchyard.hasTokens" -}}
{{- if or .Values.auth.existingSecret .Values.auth.tokens }}true{{ end }}
{{- end }}
{{- define "switchyard.tokensSecret" -}}
{{- .Values.auth.existingSecret | default (include "switchyard.fullname" .) }}
{{- end }}
{{- define "switchyard.tokensSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}tokens{{ end }}
{{- end }}

{{/* Where the tokens file is mounted. */}}
{{- define "switchyard.tokensPath" -}}
/etc/switchyard/tokens/tokens
{{- end }}

{{/* Pod-level security: the image's non-root user, no privilege. */}}
{{- define "switchyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "switchyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
{{- end }}
