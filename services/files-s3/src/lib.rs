//! S3 implementation of the FileStore
