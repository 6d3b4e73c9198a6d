"""zinc's managed model catalog: which models can be installed, where they live, and downloading them.

Modules: entries (catalog entries, the built-in catalog and `$ZINC_HOME/catalog.json`, model id
rules), store (installed models under `$ZINC_HOME/models`, the default model), download (resumable,
checksummed HTTP downloads), registry (`CatalogRegistry`, the `ModelRegistry` the server uses).
Imports: zinc.model (bundled model paths, supported architectures), zinc.engine.models,
zinc.errors, httpx2, the stdlib; never the compiler.
"""
