{{/* Names and labels, the way `helm create` lays them out. */}}
{{- define "headroom.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "headroom.fullname" -}}
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

{{- define "headroom.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headroom.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "headroom.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "headroom.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ include "headroom.mode" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "headroom.mode" -}}
{{- if not (has .Values.mode (list "gateway" "sidecar")) }}
{{- fail (printf "mode must be gateway or sidecar, got %q" (toString .Values.mode)) }}
{{- end }}
{{- .Values.mode }}
{{- end }}

{{- define "headroom.lengthLogMode" -}}
{{- if not (has .Values.lengthLog.mode (list "stdout" "volume" "off")) }}
{{- fail (printf "lengthLog.mode must be stdout, volume or off, got %q" (toString .Values.lengthLog.mode)) }}
{{- end }}
{{- .Values.lengthLog.mode }}
{{- end }}

{{- define "headroom.replicas" -}}
{{- if kindIs "invalid" .Values.replicaCount }}
{{- if eq (include "headroom.mode" .) "sidecar" }}1{{ else }}2{{ end }}
{{- else }}
{{- .Values.replicaCount }}
{{- end }}
{{- end }}

{{- define "headroom.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret }}{{ .Values.apiKeys.existingSecret }}{{ else }}{{ include "headroom.fullname" . }}-api-keys{{ end }}
{{- end }}

{{/* The upstream headroom forwards to. */}}
{{- define "headroom.upstreamURL" -}}
{{- if eq (include "headroom.mode" .) "sidecar" }}
{{- printf "http://127.0.0.1:%d" (int .Values.sidecar.vllm.port) }}
{{- else }}
{{- required "upstream.url is required in gateway mode (the vLLM Service, e.g. http://vllm:8000)" .Values.upstream.url }}
{{- end }}
{{- end }}

{{- define "headroom.shutdownTimeout" -}}
{{- $server := default dict .Values.config.server }}
{{- $timeout := 30 }}
{{- if hasKey $server "shutdown_timeout" }}{{ $timeout = $server.shutdown_timeout }}{{ end }}
{{- int (ceil (float64 $timeout)) }}
{{- end }}

{{/* SIGTERM comes after the preStop sleep; then the drain may take shutdown_timeout. */}}
{{- define "headroom.gracePeriod" -}}
{{- add (int .Values.termination.preStopSeconds) (int (include "headroom.shutdownTimeout" .)) (int .Values.termination.extraSeconds) }}
{{- end }}

{{/* headroom.toml: the user's `config` map with the keys the chart owns set. */}}
{{- define "headroom.config" -}}
{{- $cfg := deepCopy (default dict .Values.config) }}
{{- $server := default dict (get $cfg "server") }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" (int .Values.port) }}
{{- $_ := set $cfg "server" $server }}
{{- $upstream := default dict (get $cfg "upstream") }}
{{- $_ := set $upstream "url" (include "headroom.upstreamURL" .) }}
{{- $_ := set $cfg "upstream" $upstream }}
{{- $lengthLog := default dict (get $cfg "length_log") }}
{{- $mode := include "headroom.lengthLogMode" . }}
{{- if eq $mode "stdout" }}
{{- $_ := set $lengthLog "path" "-" }}
{{- else }}
{{- $_ := unset $lengthLog "path" }}{{/* volume: HEADROOM_LENGTH_LOG_PATH names the pod's file */}}
{{- end }}
{{- $_ := set $cfg "length_log" $lengthLog }}
{{- include "headroom.toml" $cfg }}
{{- end }}

{{/*
A map as TOML, for headroom.toml's shapes: [section] tables of scalars and lists,
[models."name"] tables, and [[upstreams]] arrays of tables. Scalars and lists are written
with toJson: a JSON string, number, boolean or array of them is valid TOML, and whole
numbers stay whole (8192, not 8192.0). Null values are left out (unset = default).
*/}}
{{- define "headroom.toml" -}}
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
