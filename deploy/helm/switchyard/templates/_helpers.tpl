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

{{/*
Where the tokens file comes from: "existing" (auth.existingSecret),
"inline" (auth.tokens, in the release's Secret), "generated" (the chart's
tokens Secret) or "" (none: auth.insecure).
*/}}
{{- define "switchyard.tokensSource" -}}
{{- if .Values.auth.existingSecret }}existing
{{- else if .Values.auth.tokens }}inline
{{- else if and .Values.auth.generate.enabled (not .Values.auth.insecure) }}generated
{{- end }}
{{- end }}

{{/* Whether the pods get a tokens file, and the Secret and key holding it. */}}
{{- define "switchyard.hasTokens" -}}
{{- if include "switchyard.tokensSource" . }}true{{ end }}
{{- end }}
{{- define "switchyard.generatedTokensSecret" -}}
{{- printf "%s-tokens" (include "switchyard.fullname" .) }}
{{- end }}
{{- define "switchyard.tokensSecret" -}}
{{- $source := include "switchyard.tokensSource" . }}
{{- if eq $source "existing" }}{{ .Values.auth.existingSecret }}
{{- else if eq $source "generated" }}{{ include "switchyard.generatedTokensSecret" . }}
{{- else }}{{ include "switchyard.fullname" . }}
{{- end }}
{{- end }}
{{- define "switchyard.tokensSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}tokens{{ end }}
{{- end }}

{{/* Where the tokens file is mounted. */}}
{{- define "switchyard.tokensPath" -}}
/etc/switchyard/tokens/tokens
{{- end }}

{{/*
The generated tokens, as JSON {"operator": TOKEN, "agent": TOKEN}. Takes
(dict "existing" SECRET): the tokens Secret as `lookup` returned it (an
empty map under `helm template` and on first install). A token already in
that Secret is kept, so an upgrade never changes the tokens; a missing one
is made like `switchyard-server token create` makes them: sy_ and 64 hex
digits (the SHA-256 of 64 random alphanumerics).
*/}}
{{- define "switchyard.generatedTokens" -}}
{{- $data := dig "data" (dict) (.existing | default (dict)) }}
{{- $tokens := dict }}
{{- range $role := list "operator" "agent" }}
{{- $key := printf "%s-token" $role }}
{{- if and (hasKey $data $key) (index $data $key) }}
{{- $_ := set $tokens $role (index $data $key | b64dec) }}
{{- else }}
{{- $_ := set $tokens $role (printf "sy_%s" (randAlphaNum 64 | sha256sum)) }}
{{- end }}
{{- end }}
{{- toJson $tokens }}
{{- end }}

{{/*
The tokens file for the generated tokens: their SHA-256 only (the server
hashes a token the same way), so the server's filesystem never holds one.
Takes (dict "tokens" TOKENS "namespace" NS).
*/}}
{{- define "switchyard.generatedTokensFile" -}}
{{- $namespace := .namespace }}
{{- $entries := list }}
{{- range $role := list "operator" "agent" }}
{{- $entries = append $entries (dict "name" (printf "helm-%s" $role) "namespace" $namespace "role" $role "sha256" (index $.tokens $role | sha256sum)) }}
{{- end }}
{{- toPrettyJson $entries }}
{{- end }}

{{/* TLS: where the files are mounted, and the server flags naming them. */}}
{{- define "switchyard.tlsDir" -}}
/etc/switchyard/tls
{{- end }}
{{- define "switchyard.clientCADir" -}}
/etc/switchyard/client-ca
{{- end }}
{{- define "switchyard.serverArgs" -}}
{{- $args := list "serve" }}
{{- if .Values.tls.enabled }}
{{- $dir := include "switchyard.tlsDir" . }}
{{- $args = concat $args (list "--tls-cert" (printf "%s/tls.crt" $dir) "--tls-key" (printf "%s/tls.key" $dir)) }}
{{- if .Values.tls.clientCA.secretName }}
{{- $args = concat $args (list "--tls-client-ca" (printf "%s/ca.crt" (include "switchyard.clientCADir" .))) }}
{{- end }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/* The URL agents and clients in the cluster use. */}}
{{- define "switchyard.url" -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" .Values.tls.enabled) (include "switchyard.fullname" .) .Release.Namespace (int .Values.server.grpcPort) }}
{{- end }}

{{/*
Settings the schema cannot check, refused at render time with what to do
instead: a pod that would only crash-loop is never created.
*/}}
{{- define "switchyard.validate" -}}
{{- if not .Values.image.repository }}
{{- fail (printf "image.repository is required: no registry publishes the Switchyard image. Build it from the repository root and push it to a registry the cluster can pull from:\n\n  docker build -t REGISTRY/switchyard:%s .\n  docker push REGISTRY/switchyard:%s\n\nthen install with --set image.repository=REGISTRY/switchyard (the tag defaults to the chart's appVersion, %s)." .Chart.AppVersion .Chart.AppVersion .Chart.AppVersion) }}
{{- end }}
{{- if and (not (include "switchyard.hasTokens" .)) (not .Values.auth.insecure) }}
{{- fail "no API tokens: a server listening on 0.0.0.0 refuses to start without them. Set auth.generate.enabled=true (the chart makes an operator and an agent token), auth.existingSecret (a Secret holding a tokens file) or auth.tokens; auth.insecure=true serves without tokens (trials on a private network only)." }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: a kubernetes.io/tls Secret (tls.crt, tls.key) whose certificate names the Service, e.g. made by cert-manager or with\n\n  kubectl create secret tls NAME --cert=server.pem --key=server.key" }}
{{- end }}
{{- if and .Values.tls.secretName (not .Values.tls.enabled) }}
{{- fail "tls.secretName is set but tls.enabled is false: set tls.enabled=true to serve TLS, or drop tls.secretName" }}
{{- end }}
{{- if and .Values.tls.clientCA.secretName (not .Values.tls.enabled) }}
{{- fail "tls.clientCA.secretName (mTLS) needs tls.enabled=true and tls.secretName: the server asks for client certificates only over TLS" }}
{{- end }}
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
