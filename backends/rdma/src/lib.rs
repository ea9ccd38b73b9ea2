//! Safe RDMA layer (placeholder).
