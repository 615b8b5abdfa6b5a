#!/usr/bin/env bash
# A local Kubernetes control plane: the upstream kube-apiserver and etcd, built from
# their Go modules (hack/controlplane/), started on loopback with generated
# certificates and an admin kubeconfig.
#
#   hack/controlplane.sh build            build the binaries once (reused afterwards)
#   hack/controlplane.sh up   [--dir D]   start in the background, print the kubeconfig path
#   hack/controlplane.sh run  [--dir D]   start in the foreground; stops both on TERM/INT
#   hack/controlplane.sh down [--dir D]   stop what `up` started
#   hack/controlplane.sh restart apiserver|etcd [--dir D] [--down S]
#                                         stop one of them, wait S seconds, start it again
#                                         (same port, same etcd data); for fault tests
#   hack/controlplane.sh crds [--kubeconfig K]   install crds/ and wait until they are served
#   hack/controlplane.sh pki  [--dir D]   only make the certificates (hack/gpunode.sh ships them)
#   hack/controlplane.sh node-cert NAME [--dir D]   a kubelet's client certificate (system:node:NAME)
#
# Certificates are made with openssl, or copied from $VRAMFIT_PKI when set (a
# pki/ folder that `pki` made on another machine).
#
# Binaries go to $VRAMFIT_BIN (default ~/.cache/vramfit/bin), outside the clone, so a
# fresh clone reuses them. The state folder defaults to ~/.cache/vramfit/controlplane.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=${VRAMFIT_BIN:-$HOME/.cache/vramfit/bin}
dir=$HOME/.cache/vramfit/controlplane

log() { printf 'controlplane: %s\n' "$*" >&2; }

stamp() {
  # The binaries are rebuilt when the pinned module versions change.
  cat "$here/controlplane/apiserver/go.sum" "$here/controlplane/etcd/go.sum" | sha256sum | cut -c1-16
}

build() {
  # A folder of binaries that travelled without Go (hack/gpunode.sh): use them as they are.
  if [[ -f $bin/.prebuilt && -x $bin/kube-apiserver && -x $bin/etcd ]]; then
    return 0
  fi
  local want
  want=$(stamp)
  if [[ -x $bin/kube-apiserver && -x $bin/etcd && "$(cat "$bin/.stamp" 2>/dev/null)" == "$want" ]]; then
    return 0
  fi
  mkdir -p "$bin"
  log "building etcd (go.etcd.io/etcd/server/v3) into $bin"
  (cd "$here/controlplane/etcd" && go build -trimpath -o "$bin/etcd" .)
  log "building kube-apiserver (k8s.io/kubernetes) into $bin; the first build takes several minutes"
  (cd "$here/controlplane/apiserver" && go build -trimpath -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
  echo "$want" >"$bin/.stamp"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

certs() {
  local pki=$dir/pki
  mkdir -p "$pki"
  [[ -f $pki/admin.crt ]] && return 0
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
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$pki/apiserver.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=vramfit-admin" \
    -keyout "$pki/admin.key" -out "$pki/admin.csr" 2>/dev/null
  # X.509 v3 (an extension present): rustls refuses v1 client certificates.
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' >"$pki/admin.ext"
  openssl x509 -req -in "$pki/admin.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$pki/admin.ext" -out "$pki/admin.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
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

kubeconfig() {
  local port=$1 pki=$dir/pki
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: vramfit-local
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")
users:
- name: vramfit-admin
  user:
    client-certificate-data: $(base64 -w0 <"$pki/admin.crt")
    client-key-data: $(base64 -w0 <"$pki/admin.key")
contexts:
- name: vramfit-local
  context: {cluster: vramfit-local, user: vramfit-admin, namespace: default}
current-context: vramfit-local
EOF
}

start_etcd() {
  local etcd_port peer_port
  read -r etcd_port peer_port _ <"$dir/ports"
  "${launcher[@]}" "$bin/etcd" --data-dir "$dir/etcd-data" --name vramfit \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "vramfit=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --log-level warn >>"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  disown $!
}

start_apiserver() {
  local etcd_port api_port pki=$dir/pki
  read -r etcd_port _ api_port <"$dir/ports"
  "${launcher[@]}" "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --kubelet-client-certificate "$pki/admin.crt" --kubelet-client-key "$pki/admin.key" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged --disable-admission-plugins ServiceAccount \
    >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  disown $!
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
  rm -f "$dir/kubeconfig" "$dir/ready" "$dir/restarting" "$dir/etcd.log" "$dir/apiserver.log"
  certs
  local api_port
  api_port=$(free_port)
  # The ports stay the same over `restart`, so clients keep their kubeconfig.
  echo "$(free_port) $(free_port) $api_port" >"$dir/ports"
  rm -rf "$dir/etcd-data"
  start_etcd
  start_apiserver
  kubeconfig "$api_port"
  wait_ready || return 1
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
  # The API server first, while etcd still answers its graceful shutdown.
  local p
  for p in apiserver etcd; do
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
    while [[ -f $dir/restarting ]] || { kill -0 "$(cat "$dir/apiserver.pid" 2>/dev/null)" 2>/dev/null \
      && kill -0 "$(cat "$dir/etcd.pid" 2>/dev/null)" 2>/dev/null; }; do
      sleep 1 &
      wait $! || true
    done
    log "a control-plane process exited"
    stop
    exit 1
    ;;
  down) stop ;;
  restart) restart_process "$restart_what" ;;
  pki) certs ;;
  node-cert) [[ -n $node_name ]] || { log "node-cert needs a node name"; exit 2; }; node_cert "$node_name" ;;
  crds) install_crds "${kubeconfig_arg:-$dir/kubeconfig}" ;;
  *) sed -n '2,19p' "$0"; exit 2 ;;
esac
