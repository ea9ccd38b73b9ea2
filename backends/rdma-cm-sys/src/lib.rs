//! Raw libibverbs / librdmacm bindings (placeholder).
