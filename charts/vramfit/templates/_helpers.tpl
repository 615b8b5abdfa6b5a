{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "vramfit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name of the objects. */}}
{{- define "vramfit.fullname" -}}
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

{{- define "vramfit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "vramfit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vramfit
{{- end }}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "controller"). */}}
{{- define "vramfit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vramfit.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "vramfit.controller.serviceAccountName" -}}
{{- default (printf "%s-controller" (include "vramfit.fullname" .)) .Values.serviceAccount.controller.name }}
{{- end }}

{{- define "vramfit.agent.serviceAccountName" -}}
{{- default (printf "%s-agent" (include "vramfit.fullname" .)) .Values.serviceAccount.agent.name }}
{{- end }}

{{/* image reference: pass (dict "image" .Values.controller.image "ctx" $). */}}
{{- define "vramfit.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* KUBERNETES_SERVICE_HOST and _PORT from apiServer, for both containers' env. */}}
{{- define "vramfit.apiServerEnv" -}}
{{- with .Values.apiServer }}
{{- if .host }}
{{- if not (and .port (gt (int .port) 0)) }}
{{- fail "apiServer.host needs apiServer.port" }}
{{- end }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .port | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The kubelet's root folder without a trailing slash. */}}
{{- define "vramfit.kubeletRoot" -}}
{{- .Values.kubeletRoot | trimSuffix "/" }}
{{- end }}

{{/* The controller's rules on namespaced objects (a ClusterRole, or a Role in controller.watchNamespace). */}}
{{- define "vramfit.controller.namespacedRules" }}
- apiGroups: ["vramfit.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["vramfit.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* The /ui page's port in the controller pod. */}}
{{- define "vramfit.controller.uiPort" -}}
{{- $parts := splitList ":" .Values.controller.ui.address -}}
{{- last $parts -}}
{{- end }}

{{/*
"true" when /ui listens off loopback. Only behind Kubernetes authentication:
otherwise it would show every namespace's jobs to whoever reaches the pod.
*/}}
{{- define "vramfit.controller.uiExposed" -}}
{{- $ui := .Values.controller.ui -}}
{{- $loopback := hasPrefix "127." $ui.address -}}
{{- if and (not $loopback) (ne $ui.authentication "kubernetes") -}}
{{- fail (printf "controller.ui.address %s is off loopback: /ui would show every namespace's jobs to whoever reaches it; set controller.ui.authentication=kubernetes, or keep it on 127.0.0.1 and use kubectl port-forward" $ui.address) -}}
{{- end -}}
{{- if eq (include "vramfit.controller.uiPort" .) (toString .Values.controller.metricsPort) -}}
{{- fail (printf "controller.ui.address %s uses metricsPort %v: give /ui a port of its own" $ui.address .Values.controller.metricsPort) -}}
{{- end -}}
{{- not $loopback -}}
{{- end }}
