# syntax=docker/dockerfile:1
# The teamgpu image: the release binary on distroless, run as uid 65532 (the Deployment's
# runAsUser). From a clean checkout:
#   docker build -t ghcr.io/teamgpu/teamgpu:v0.1.0 .
# The tag is `v` + the workspace version of Cargo.toml (e2e/tests/image.rs checks
# config/manager against it).

FROM rust:1.95-bookworm AS builder
WORKDIR /src

# Dependencies first, in a layer that is rebuilt only when a manifest or Cargo.lock changes:
# the workspace's manifests with stub sources (the benches are declared in operator/Cargo.toml,
# so cargo wants their files; they are small and rarely change).
COPY Cargo.toml Cargo.lock ./
COPY operator/Cargo.toml operator/Cargo.toml
COPY operator/benches operator/benches
COPY operator/synthetic/Cargo.toml operator/synthetic/Cargo.toml
COPY e2e/Cargo.toml e2e/Cargo.toml
RUN mkdir -p operator/src operator/synthetic/src e2e/src \
    && echo 'fn main() {}' > operator/src/main.rs \
    && touch operator/src/lib.rs operator/synthetic/src/lib.rs e2e/src/lib.rs \
    && cargo build --release --locked -p teamgpu \
    && rm -rf operator/src target/release/.fingerprint/teamgpu-* target/release/deps/teamgpu-* target/release/deps/libteamgpu-*

# The operator itself; its built-in example includes the samples of config/samples, and
# `teamgpu manifests` the kustomizations of config/default and what they name.
COPY operator/src operator/src
COPY config/samples config/samples
COPY config/default config/default
COPY config/crd config/crd
COPY config/rbac config/rbac
COPY config/manager config/manager
RUN cargo build --release --locked -p teamgpu \
    && cp target/release/teamgpu /teamgpu

# glibc, not musl: the builder targets x86_64/aarch64-unknown-linux-gnu, so the binary is
# linked dynamically against glibc and libgcc_s (unwinding). distroless/cc has exactly those
# (static-debian12 has no libc and the binary would not start); rustls keeps OpenSSL out.
# Debian 12 like the builder: the glibc the binary was linked against is the one it runs on.
FROM gcr.io/distroless/cc-debian12:nonroot
# On the image's PATH, so that the Deployment's `command: ["teamgpu", "run"]` finds it.
COPY --from=builder /teamgpu /usr/local/bin/teamgpu
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/teamgpu"]
CMD ["run"]
