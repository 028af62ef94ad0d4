{{/*
Names, labels and the checks every template relies on. Every template takes
its names from here so a nameOverride changes them all together.
*/}}

{{- define "switchyard-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard-agent.fullname" -}}
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

{{- define "switchyard-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "switchyard-agent.labels" -}}
helm.sh/chart: {{ include "switchyard-agent.chart" . }}
{{ include "switchyard-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
app.kubernetes.io/component: agent
{{- end }}

{{- define "switchyard-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "switchyard-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchyard-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the agent directory, the CA and the client certificate are mounted. */}}
{{- define "switchyard-agent.dir" -}}
/etc/switchyard-agent
{{- end }}
{{- define "switchyard-agent.caDir" -}}
/etc/switchyard-agent-tls/ca
{{- end }}
{{- define "switchyard-agent.clientCertDir" -}}
/etc/switchyard-agent-tls/client
{{- end }}

{{/*
Settings the schema cannot check, refused at render time with what to do
instead: an agent that could only crash-loop or never connect is not
created.
*/}}
{{- define "switchyard-agent.validate" -}}
{{- if not .Values.image.repository }}
{{- fail (printf "image.repository is required: no registry publishes the Switchyard image. Build it from the repository root (it holds switchyard-agent) and push it to a registry the cluster can pull from:\n\n  docker build -t REGISTRY/switchyard:%s .\n  docker push REGISTRY/switchyard:%s\n\nthen install with --set image.repository=REGISTRY/switchyard (the tag defaults to the chart's appVersion, %s)." .Chart.AppVersion .Chart.AppVersion .Chart.AppVersion) }}
{{- end }}
{{- if not .Values.server.url }}
{{- fail "server.url is required: the Switchyard server's gRPC URL, e.g. --set server.url=http://RELEASE-switchyard.NAMESPACE.svc:50051 for the server chart's Service (https://… when its tls.enabled, with tls.ca.secretName)" }}
{{- end }}
{{- if and (hasPrefix "https://" .Values.server.url) (not .Values.tls.ca.secretName) }}
{{- fail "an https:// server.url needs tls.ca.secretName: a Secret holding the CA (PEM) that signed the server's certificate, under tls.ca.key (ca.crt)" }}
{{- end }}
{{- if and (not (hasPrefix "https://" .Values.server.url)) (or .Values.tls.ca.secretName .Values.tls.clientCert.secretName) }}
{{- fail "tls.ca and tls.clientCert are for an https:// server.url; the agent refuses TLS files with an http:// URL" }}
{{- end }}
{{- if and .Values.token.required (not .Values.token.secretName) }}
{{- fail "token.secretName is required: the Secret (in the release's namespace) holding the agent token under token.secretKey. The server chart generates RELEASE-switchyard-tokens with key agent-token: --set token.secretName=RELEASE-switchyard-tokens. Only for a server with auth.insecure=true, set token.required=false." }}
{{- end }}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.graceSeconds) }}
{{- fail "terminationGracePeriodSeconds must exceed graceSeconds: the agent needs time after its leases' grace to hand back what is still running" }}
{{- end }}
{{- end }}

{{/* Pod-level security: the image's non-root user, no privilege. */}}
{{- define "switchyard-agent.podSecurityContext" -}}
{{- if .Values.podSecurityContext }}
{{- toYaml .Values.podSecurityContext }}
{{- else -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}
{{- end }}

{{- define "switchyard-agent.containerSecurityContext" -}}
{{- if .Values.securityContext }}
{{- toYaml .Values.securityContext }}
{{- else -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
{{- end }}
{{- end }}
