"""`laya-grpc bench`: upstream laya and our engine, gRPC and HTTP side by side."""
