"""Generated code for the ppfs.v1 gRPC contracts (proto/ppfs/v1). Regenerate with proto/generate.sh."""
