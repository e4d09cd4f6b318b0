"""The gateway's fronts: HTTP (`/v1/systemone`) and the public gRPC API. Each unpacks a request,
calls the engine and packs its answer; admission, auth and readiness are its policy."""
