#!/usr/bin/env bash
# A local Kubernetes control plane: the upstream etcd and kube-apiserver (and, on
# request, kube-controller-manager and kube-scheduler), started on loopback with
# generated certificates and an admin kubeconfig. The binaries are the static,
# versioned ones of `hack/gpunode.sh build kube etcd` (the multi-call `kube`,
# v1.34.4, built from the Go modules under hack/controlplane/).
#
#   hack/controlplane.sh build            build the binaries once (reused afterwards)
#   hack/controlplane.sh up   [--dir D] [--controllers]   start in the background, print the kubeconfig path
#   hack/controlplane.sh run  [--dir D] [--controllers]   start in the foreground; stops all on TERM/INT
#   hack/controlplane.sh down [--dir D]   stop what `up` started
#   hack/controlplane.sh restart apiserver|etcd [--dir D] [--down S]
#                                         stop one of them, wait S seconds, start it again
#                                         (same port, same etcd data); for fault tests
#   hack/controlplane.sh crds [--kubeconfig K]   install crds/ and wait until they are served
#   hack/controlplane.sh pki  [--dir D]   only make the certificates (hack/gpunode.sh ships them)
#   hack/controlplane.sh node-cert NAME [--dir D]   a kubelet's client certificate (system:node:NAME)
#
# --controllers (or VRAMFIT_CONTROLLERS=1) also starts kube-controller-manager
# (garbage collector, ReplicaSets, namespace deletion, ServiceAccounts and their
# token Secrets, CSR signing, ...) and kube-scheduler, each with a certificate of
# its own (system:kube-controller-manager, system:kube-scheduler). Off by
# default: the integration tests expect objects to stay as they wrote them.
#
# Certificates are made with openssl, or copied from $VRAMFIT_PKI when set (a
# pki/ folder that `pki` made on another machine). The API server listens on
# 127.0.0.1 unless VRAMFIT_APISERVER_BIND names another address (0.0.0.0 for
# pods on a pod network, hack/gpunode.sh up --pod-network); its certificate
# carries the extra names of VRAMFIT_APISERVER_SANS (IP:A,DNS:N). Pods get
# ServiceAccount tokens only with VRAMFIT_SERVICEACCOUNT_ADMISSION=1.
#
# Binaries go to $VRAMFIT_BIN/node (default ~/.cache/vramfit/bin/node), outside the
# clone, so a fresh clone reuses them; a $VRAMFIT_BIN marked .prebuilt (an unpacked
# bundle, or hack/gpunode.sh's own folder) is used as it is, without Go. The state
# folder defaults to ~/.cache/vramfit/controlplane.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}
dir=$HOME/.cache/vramfit/controlplane
controllers=${VRAMFIT_CONTROLLERS:-0}
[[ $controllers == 1 ]] || controllers=0

log() { printf 'controlplane: %s\n' "$*" >&2; }

# The folder of kube-apiserver, kube-controller-manager, kube-scheduler (links to
# `kube`) and etcd.
if [[ -f $bin/.prebuilt ]]; then kbin=$bin; else kbin=$bin/node; fi

build() {
  # Binaries that travelled without Go (an unpacked hack/gpunode.sh bundle): as they are.
  if [[ -f $bin/.prebuilt ]]; then
    [[ -x $kbin/kube-apiserver && -x $kbin/etcd ]] || { log "$bin is marked .prebuilt but lacks kube-apiserver or etcd"; exit 1; }
    return 0
  fi
  # The GPU node's build: kube-apiserver is compiled once per machine, and
  # again only when its pins or flags change (hack/gpunode.sh's stamps; a warm
  # run checks them only). The first build takes several minutes.
  VRAMFIT_BIN=$bin "$here/gpunode.sh" build kube etcd >&2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The API server's serving certificate: loopback names, and the extra ones in
# $VRAMFIT_APISERVER_SANS (for example IP:10.89.0.1, the pod network's gateway
# of `hack/gpunode.sh up --pod-network`).
apiserver_sans() { echo "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc${VRAMFIT_APISERVER_SANS:+,$VRAMFIT_APISERVER_SANS}"; }

sign_apiserver() {
  local pki=$dir/pki
  printf 'subjectAltName=%s\n' "$(apiserver_sans)" >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
}

# An existing certificate that lacks one of $VRAMFIT_APISERVER_SANS is signed
# again (same key, same CA: every kubeconfig stays valid).
apiserver_sans_current() {
  local pki=$dir/pki have s
  [[ -n ${VRAMFIT_APISERVER_SANS:-} && -f $pki/apiserver.crt ]] || return 0
  have=$(openssl x509 -in "$pki/apiserver.crt" -noout -ext subjectAltName 2>/dev/null | tr -d ' \n' | sed 's/IPAddress:/IP:/g')
  for s in ${VRAMFIT_APISERVER_SANS//,/ }; do
    [[ ,${have#*:}, == *",$s,"* ]] && continue
    [[ -f $pki/ca.key && -f $pki/apiserver.csr ]] || { log "apiserver.crt lacks $s and no CA key to sign it again"; exit 1; }
    log "signing apiserver.crt again for $(apiserver_sans)"
    sign_apiserver
    return 0
  done
}

certs() {
  local pki=$dir/pki
  mkdir -p "$pki"
  [[ -f $pki/admin.crt ]] && { apiserver_sans_current; return 0; }
  # Certificates made elsewhere (a machine without openssl): copied as they are.
  if [[ -n ${VRAMFIT_PKI:-} ]]; then
    [[ -f $VRAMFIT_PKI/admin.crt ]] || { log "VRAMFIT_PKI=$VRAMFIT_PKI holds no admin.crt"; exit 1; }
    cp -r "$VRAMFIT_PKI/." "$pki/"
    return 0
  fi
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=vramfit-local-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  sign_apiserver
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=vramfit-admin" \
    -keyout "$pki/admin.key" -out "$pki/admin.csr" 2>/dev/null
  # X.509 v3 (an extension present): rustls refuses v1 client certificates.
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$pki/admin.ext"
  openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/admin.ext" -out "$pki/admin.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

# client_cert NAME SUBJECT: pki/NAME.{crt,key}, a client certificate signed by
# the CA, unless there already.
client_cert() {
  local name=$1 subject=$2 pki=$dir/pki
  [[ -f $pki/$name.crt && -f $pki/$name.key ]] && return 0
  command -v openssl >/dev/null || { log "no $pki/$name.crt and no openssl to make it"; exit 1; }
  openssl req -newkey rsa:2048 -nodes -subj "$subject" \
    -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

# The users the default RBAC policy binds kube-controller-manager's and
# kube-scheduler's roles to.
controller_certs() {
  client_cert controller-manager "/CN=system:kube-controller-manager"
  client_cert scheduler "/CN=system:kube-scheduler"
}

# node_cert NAME: pki/node.{crt,key} for the kubelet of node NAME, user
# system:node:NAME in group system:nodes (what the Node authorizer and
# NodeRestriction recognise), and pki/node-name.
node_cert() {
  local name=$1 pki=$dir/pki
  [[ $name =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || { log "node-cert: $name is not a node name"; exit 2; }
  certs
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$name" \
    -keyout "$pki/node.key" -out "$pki/node.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$pki/node.ext"
  openssl x509 -req -in "$pki/node.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/node.ext" -out "$pki/node.crt" 2>/dev/null
  echo "$name" >"$pki/node-name"
}

# kubeconfig PORT [CERT FILE USER]: a kubeconfig with the client certificate
# pki/CERT.{crt,key} (default: the admin's, as $dir/kubeconfig).
kubeconfig() {
  local port=$1 cert=${2:-admin} file=${3:-$dir/kubeconfig} user=${4:-vramfit-admin} pki=$dir/pki
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vramfit-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 <"$pki/$cert.crt")
    client-key-data: $(base64 -w0 <"$pki/$cert.key")
contexts:
- name: vramfit-local
  context: {cluster: vramfit-local, user: $user, namespace: default}
current-context: vramfit-local
EOF
}

start_etcd() {
  local etcd_port peer_port
  read -r etcd_port peer_port _ <"$dir/ports"
  "${launcher[@]}" "$kbin/etcd" --data-dir "$dir/etcd-data" --name vramfit \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "vramfit=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --log-level warn >>"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  disown $!
}

start_apiserver() {
  local etcd_port api_port pki=$dir/pki
  # Without the ServiceAccount admission plugin pods get no ServiceAccount
  # token: the tests write pods in namespaces without one. Pods that talk to
  # the API server (the chart's, on hack/gpunode.sh's node) need it:
  # VRAMFIT_SERVICEACCOUNT_ADMISSION=1 keeps it on.
  local sa_admission=(--disable-admission-plugins ServiceAccount)
  [[ ${VRAMFIT_SERVICEACCOUNT_ADMISSION:-0} == 1 ]] && sa_admission=()
  read -r etcd_port _ api_port <"$dir/ports"
  "${launcher[@]}" "$kbin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "${VRAMFIT_APISERVER_BIND:-127.0.0.1}" --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged "${sa_admission[@]}" \
    >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  disown $!
}

# kube-controller-manager and kube-scheduler: one instance each, so no leader
# election (which would also stop them whenever the API server is down longer
# than the lease); /healthz on loopback ports of their own.
start_controllers() {
  local api_port cm_port sched_port pki=$dir/pki
  read -r _ _ api_port <"$dir/ports"
  read -r cm_port sched_port <"$dir/controller-ports"
  local cm=$dir/controller-manager.kubeconfig sched=$dir/scheduler.kubeconfig
  kubeconfig "$api_port" controller-manager "$cm" system:kube-controller-manager
  kubeconfig "$api_port" scheduler "$sched" system:kube-scheduler
  # Each controller under a ServiceAccount of its own in kube-system (the
  # default policy's system:controller:* roles); ServiceAccount token Secrets
  # signed with the API server's key; kube-root-ca.crt ConfigMaps; CSRs signed
  # by the cluster CA. No --authentication/authorization-kubeconfig: /healthz
  # is open without them, and with them both poll for a request-header CA this
  # API server does not have. Nothing is written outside $dir (the FlexVolume
  # folder defaults to /usr/libexec/kubernetes/...).
  "${launcher[@]}" "$kbin/kube-controller-manager" --kubeconfig "$cm" \
    --bind-address 127.0.0.1 --secure-port "$cm_port" --cert-dir "$dir/controller-manager" \
    --flex-volume-plugin-dir "$dir/controller-manager/flexvolume" \
    --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    >>"$dir/controller-manager.log" 2>&1 &
  echo $! >"$dir/controller-manager.pid"
  disown $!
  "${launcher[@]}" "$kbin/kube-scheduler" --kubeconfig "$sched" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --cert-dir "$dir/scheduler" \
    --leader-elect=false \
    >>"$dir/scheduler.log" 2>&1 &
  echo $! >"$dir/scheduler.pid"
  disown $!
}

# wait_healthy NAME PORT: until NAME answers ok on https://127.0.0.1:PORT/healthz
# (Python, not curl: the GPU machine may lack curl).
wait_healthy() {
  local name=$1 port=$2 i
  for i in $(seq 1 240); do
    if python3 -c 'import ssl, sys, urllib.request as u
sys.exit(u.urlopen(sys.argv[1], context=ssl._create_unverified_context(), timeout=2).read() != b"ok")' \
      "https://127.0.0.1:$port/healthz" 2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then
      log "$name exited; see $dir/$name.log"
      tail -20 "$dir/$name.log" >&2
      return 1
    fi
    sleep 0.5
  done
  log "$name not healthy after 120 s; see $dir/$name.log"
  return 1
}

# Waits until the API server answers /readyz (which includes etcd) and the
# default namespace exists.
wait_ready() {
  local i
  for i in $(seq 1 240); do
    if kubectl --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
      if KUBECONFIG=$dir/kubeconfig kubectl get namespace default >/dev/null 2>&1; then
        touch "$dir/ready"
        return 0
      fi
    fi
    if ! kill -0 "$(cat "$dir/apiserver.pid")" 2>/dev/null; then
      log "kube-apiserver exited; see $dir/apiserver.log"
      tail -20 "$dir/apiserver.log" >&2
      return 1
    fi
    sleep 0.5
  done
  log "kube-apiserver not ready after 120 s; see $dir/apiserver.log"
  return 1
}

start() {
  build
  mkdir -p "$dir"
  rm -f "$dir/kubeconfig" "$dir/ready" "$dir/restarting" "$dir/etcd.log" "$dir/apiserver.log" \
    "$dir/controller-manager.log" "$dir/scheduler.log" "$dir/controller-ports"
  certs
  [[ $controllers == 0 ]] || controller_certs
  local api_port
  api_port=$(free_port)
  # The ports stay the same over `restart`, so clients keep their kubeconfig.
  echo "$(free_port) $(free_port) $api_port" >"$dir/ports"
  rm -rf "$dir/etcd-data"
  start_etcd
  start_apiserver
  kubeconfig "$api_port"
  wait_ready || return 1
  if [[ $controllers == 1 ]]; then
    local cm_port sched_port
    cm_port=$(free_port)
    sched_port=$(free_port)
    echo "$cm_port $sched_port" >"$dir/controller-ports"
    start_controllers
    wait_healthy controller-manager "$cm_port" || return 1
    wait_healthy scheduler "$sched_port" || return 1
    log "kube-controller-manager and kube-scheduler running (logs in $dir)"
  fi
  log "ready at https://127.0.0.1:$api_port (KUBECONFIG=$dir/kubeconfig)"
}

# stop_process NAME: TERM (the API server's graceful shutdown), KILL after 5 s.
stop_process() {
  local p=$1 pid i
  [[ -f $dir/$p.pid ]] || return 0
  pid=$(cat "$dir/$p.pid")
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/$p.pid"
}

# restart apiserver|etcd: stops one process, waits --down seconds, starts it
# again on the same port (etcd on the same data) and waits until the API
# server is ready. `run` keeps watching meanwhile instead of giving up.
restart_process() {
  local p=$1
  [[ $p == apiserver || $p == etcd ]] || { log "restart: apiserver or etcd, not '$p'"; exit 2; }
  [[ -f $dir/ports && -f $dir/$p.pid ]] || { log "restart: nothing runs in $dir"; exit 1; }
  touch "$dir/restarting"
  rm -f "$dir/ready"
  stop_process "$p"
  sleep "$down"
  "start_$p"
  wait_ready || { rm -f "$dir/restarting"; return 1; }
  rm -f "$dir/restarting"
  log "$p restarted after ${down}s down"
}

stop() {
  # The controllers, then the API server while etcd still answers its graceful shutdown.
  local p
  for p in controller-manager scheduler apiserver etcd; do
    stop_process "$p"
  done
  rm -f "$dir/ready" "$dir/restarting"
}

install_crds() {
  local kubeconfig=$1
  KUBECONFIG=$kubeconfig kubectl apply --server-side --force-conflicts -f "$here/../crds" >/dev/null
  KUBECONFIG=$kubeconfig kubectl wait --for condition=established --timeout=60s \
    crd/trainingjobs.vramfit.dev crd/gpunodes.vramfit.dev >/dev/null
}

# How etcd and kube-apiserver are started. In `run` mode they die with this
# script, whatever ends it (tests start it with a parent-death signal).
launcher=()

cmd=${1:-}
shift || true
kubeconfig_arg=
node_name=
restart_what=
down=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --kubeconfig) kubeconfig_arg=$2; shift 2 ;;
    --down) down=$2; shift 2 ;;
    --controllers) controllers=1; shift ;;
    *)
      if [[ $cmd == node-cert && -z $node_name ]]; then node_name=$1; shift
      elif [[ $cmd == restart && -z $restart_what ]]; then restart_what=$1; shift
      else log "unknown argument $1"; exit 2; fi ;;
  esac
done

case $cmd in
  build) build ;;
  up) stop; start; echo "$dir/kubeconfig" ;;
  run)
    if command -v setpriv >/dev/null 2>&1; then
      launcher=(setpriv --pdeathsig KILL)
    fi
    trap 'stop; exit 0' TERM INT
    stop
    start
    echo "$dir/kubeconfig"
    # Stay in the foreground until asked to stop (or until a process dies
    # other than during a `restart`).
    watched=(apiserver etcd)
    [[ $controllers == 0 ]] || watched+=(controller-manager scheduler)
    alive() {
      local p
      for p in "${watched[@]}"; do kill -0 "$(cat "$dir/$p.pid" 2>/dev/null)" 2>/dev/null || return 1; done
    }
    while [[ -f $dir/restarting ]] || alive; do
      sleep 1 &
      wait $! || true
    done
    log "a control-plane process exited"
    stop
    exit 1
    ;;
  down) stop ;;
  restart) restart_process "$restart_what" ;;
  pki) certs; controller_certs ;;
  node-cert) [[ -n $node_name ]] || { log "node-cert needs a node name"; exit 2; }; node_cert "$node_name" ;;
  crds) install_crds "${kubeconfig_arg:-$dir/kubeconfig}" ;;
  *) sed -n '2,31p' "$0"; exit 2 ;;
esac
