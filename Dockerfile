# syntax=docker/dockerfile:1
# rekindle's image: the server and certs-gen, built with the same command as `just release`
# (which the tests and benchmarks run), on distroless/cc as the numeric non-root user.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# REKINDLE_GIT_COMMIT is read by build.rs when there is no .git directory in the build context.
ARG REKINDLE_GIT_COMMIT=unknown
ENV REKINDLE_GIT_COMMIT=${REKINDLE_GIT_COMMIT}
RUN cargo build --release --locked -p rekindle -p certs-gen --bins

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/rekindle /rekindle
COPY --from=build /src/target/release/certs-gen /certs-gen
USER 65532:65532
EXPOSE 9443 9090
ENTRYPOINT ["/rekindle"]
