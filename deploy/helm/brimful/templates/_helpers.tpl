{{/* Names and labels, the way `helm create` lays them out. */}}
{{- define "brimful.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "brimful.fullname" -}}
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

{{- define "brimful.selectorLabels" -}}
app.kubernetes.io/name: {{ include "brimful.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "brimful.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "brimful.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ include "brimful.mode" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "brimful.mode" -}}
{{- if not (has .Values.mode (list "gateway" "sidecar")) }}
{{- fail (printf "mode must be gateway or sidecar, got %q" (toString .Values.mode)) }}
{{- end }}
{{- .Values.mode }}
{{- end }}

{{- define "brimful.lengthLogMode" -}}
{{- if not (has .Values.lengthLog.mode (list "stdout" "volume" "off")) }}
{{- fail (printf "lengthLog.mode must be stdout, volume or off, got %q" (toString .Values.lengthLog.mode)) }}
{{- end }}
{{- .Values.lengthLog.mode }}
{{- end }}

{{- define "brimful.replicas" -}}
{{- if kindIs "invalid" .Values.replicaCount }}
{{- if eq (include "brimful.mode" .) "sidecar" }}1{{ else }}2{{ end }}
{{- else }}
{{- .Values.replicaCount }}
{{- end }}
{{- end }}

{{- define "brimful.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret }}{{ .Values.apiKeys.existingSecret }}{{ else }}{{ include "brimful.fullname" . }}-api-keys{{ end }}
{{- end }}

{{/* The upstream brimful forwards to. */}}
{{- define "brimful.upstreamURL" -}}
{{- if eq (include "brimful.mode" .) "sidecar" }}
{{- printf "http://127.0.0.1:%d" (int .Values.sidecar.vllm.port) }}
{{- else }}
{{- required "upstream.url is required in gateway mode (the vLLM Service, e.g. http://vllm:8000)" .Values.upstream.url }}
{{- end }}
{{- end }}

{{- define "brimful.shutdownTimeout" -}}
{{- $server := default dict .Values.config.server }}
{{- $timeout := 30 }}
{{- if hasKey $server "shutdown_timeout" }}{{ $timeout = $server.shutdown_timeout }}{{ end }}
{{- int (ceil (float64 $timeout)) }}
{{- end }}

{{/* SIGTERM comes after the preStop sleep; then the drain may take shutdown_timeout. */}}
{{- define "brimful.gracePeriod" -}}
{{- add (int .Values.termination.preStopSeconds) (int (include "brimful.shutdownTimeout" .)) (int .Values.termination.extraSeconds) }}
{{- end }}

{{/* brimful.toml: the user's `config` map with the keys the chart owns set. */}}
{{- define "brimful.config" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- $server := default dict (get $cfg "server") }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" (int .Values.port) }}
{{- $_ := set $cfg "server" $server }}
{{- $upstream := default dict (get $cfg "upstream") }}
{{- $_ := set $upstream "url" (include "brimful.upstreamURL" .) }}
{{- $_ := set $cfg "upstream" $upstream }}
{{- $lengthLog := default dict (get $cfg "length_log") }}
{{- $mode := include "brimful.lengthLogMode" . }}
{{- if eq $mode "stdout" }}
{{- $_ := set $lengthLog "path" "-" }}
{{- else }}
{{- $_ := unset $lengthLog "path" }}{{/* volume: BRIMFUL_LENGTH_LOG_PATH names the pod's file */}}
{{- end }}
{{- $_ := set $cfg "length_log" $lengthLog }}
{{- include "brimful.toml" $cfg }}
{{- end }}

{{/*
A map as TOML, for brimful.toml's shapes: [section] tables of scalars and lists,
[models."name"] tables, and [[upstreams]] arrays of tables. Scalars and lists are written
with toJson: a JSON string, number, boolean or array of them is valid TOML, and whole
numbers stay whole (8192, not 8192.0). Null values are left out (unset = default).
*/}}
{{- define "brimful.toml" -}}
{{- range $section, $body := . }}
{{- if kindIs "slice" $body }}
{{- range $body }}
[[{{ $section }}]]
{{- range $key, $value := . }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{ end }}
{{- else if eq $section "models" }}
{{- range $model, $keys := $body }}
[models.{{ toJson $model }}]
{{- range $key, $value := $keys }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{ end }}
{{- else if kindIs "map" $body }}
[{{ $section }}]
{{- range $key, $value := $body }}
{{- if not (kindIs "invalid" $value) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{ else }}
{{- fail (printf "config.%s must be a table (a map of keys), got %v" $section $body) }}
{{- end }}
{{- end }}
{{- end }}
