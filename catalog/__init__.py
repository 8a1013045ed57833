"""The catalog, above the storage adapters: the repository layout of models and versions in a store
(`repository`), publishing a version with its manifest written last (`publish`), and the Redis index that
many routers read fast (`index`). Storage adapters stay pure byte stores; this package gives the bytes
their meaning."""
