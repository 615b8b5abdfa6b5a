# syntax=docker/dockerfile:1
# The vramfit images where a registry is reachable:
#   docker build --target vramfit       -t vramfit:0.1.0 .
#   docker build --target vramfit-agent -t vramfit-agent:0.1.0 .
# and, for test clusters only (the chart's agent.simulate), the agent with its
# simulated node (the `sim` feature, which the shipped agent leaves out):
#   docker build --target vramfit-agent-sim -t vramfit-agent-sim:0.1.0 .
# hack/images.sh builds the same images without pulling any base image
# (OCI tarballs for `ctr images import`).

# --- build: both binaries, the agent with the cuda feature (cudarc and NVML are
# loaded at run time, so no CUDA toolkit is needed to build).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin vramfit \
 && cargo build --release --locked -p vramfit-agent --features cuda --bin vramfit-agent \
 && install -D -m 0755 target/release/vramfit /out/vramfit \
 && install -D -m 0755 target/release/vramfit-agent /out/vramfit-agent \
 && strip --strip-debug /out/vramfit /out/vramfit-agent

# --- the NRI plugin the chart runs beside the agent (hack/node/containerd/nri-cdi):
# static Go, no cgo.
FROM golang:1.25-bookworm AS nri
ARG VERSION=0.1.0
WORKDIR /src
COPY hack/node/containerd/ .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION}" \
      -o /out/vramfit-nri-cdi ./nri-cdi

# --- the agent with the simulated node (`--features sim`), for test clusters.
FROM build AS build-sim
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p vramfit-agent --features sim --bin vramfit-agent \
 && install -D -m 0755 target/release/vramfit-agent /out-sim/vramfit-agent \
 && strip --strip-debug /out-sim/vramfit-agent

# --- the controller and CLI: glibc and libgcc only, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot AS vramfit
COPY --from=build /out/vramfit /usr/local/bin/vramfit
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/vramfit"]
CMD ["controller"]

# --- the simulating agent (agent.simulate): plays GPU nodes and their kubelet
# from a pod; needs no GPU, no NVML, no NRI plugin.
FROM gcr.io/distroless/cc-debian12:nonroot AS vramfit-agent-sim
COPY --from=build-sim /out-sim/vramfit-agent /usr/local/bin/vramfit-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/vramfit-agent"]
CMD ["run"]

# --- the node agent (the last stage, so what a plain `docker build .` gives):
# root (it reads /proc of every process through hostPID and signals a process
# over its budget; the chart drops every capability but KILL), and the NRI
# plugin the chart runs as its sidecar.
FROM gcr.io/distroless/cc-debian12 AS vramfit-agent
COPY --from=build /out/vramfit-agent /usr/local/bin/vramfit-agent
COPY --from=nri /out/vramfit-nri-cdi /usr/local/bin/vramfit-nri-cdi
USER 0:0
ENTRYPOINT ["/usr/local/bin/vramfit-agent"]
CMD ["run"]
