"""Router settings, parsed once by `mmhost router` and passed down. Environment prefix MMHOST_ROUTER_;
the Redis URL also comes from MMHOST_REDIS_URL."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from router.placement_policy import PlacementConfig


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MMHOST_ROUTER_", populate_by_name=True)

    listen: str = Field("127.0.0.1:8000", description="gRPC address tenants call (v2 + Triton extensions)")
    metrics_port: int = Field(9100, ge=0, le=65535, description="Prometheus port; 0 turns it off")
    metrics_host: str = Field("127.0.0.1", description="Prometheus bind address")
    redis_url: str | None = Field(
        None, validation_alias=AliasChoices("redis_url", "MMHOST_REDIS_URL", "MMHOST_ROUTER_REDIS_URL"),
        description="Redis mode: hosts from heartbeats, tenants from the Redis registry",
    )
    hosts: list[str] = Field(default_factory=list, description="embedded mode: static hostd addresses, polled")
    tenants_file: Path | None = Field(None, description="embedded mode: tenants file (key hashes)")
    store: str | None = Field(None, description="model store for the catalog; unset = hosts answer NOT_FOUND")
    catalog_prefix: str = Field("mmhost:catalog:", description="Redis key prefix of the catalog index")
    tenants_prefix: str = Field("mmhost:tenants:", description="Redis key prefix of the tenant registry")
    heartbeat_prefix: str = Field("mmhost:hosts:", description="Redis key prefix of hostd heartbeats")
    refresh_interval_s: float = Field(0.5, gt=0, description="how often the host view and tenants refresh")
    poll_timeout_s: float = Field(1.0, gt=0, description="static mode: Status call timeout per host")
    catalog_ttl_s: float = Field(5.0, ge=0, description="how long a catalog lookup is reused")
    catalog_miss_ttl_s: float = Field(1.0, ge=0, description="how long 'no such model' is reused")
    max_attempts: int = Field(3, ge=1, description="tries per request (first try + retries on other hosts)")
    retry_budget_ratio: float = Field(0.2, ge=0, description="retries earned per request (retry budget)")
    retry_budget_cap: float = Field(100.0, ge=1, description="retry budget: most retries saved up")
    default_timeout_s: float = Field(0.0, ge=0, description="deadline for calls that set none; 0 = none")
    max_message_bytes: int = Field(64 << 20, gt=0, description="largest request or response forwarded")
    access_log: str | None = Field(None, description="access log file (JSON lines); '-' = stdout; unset = off")
    hot_queue_depth: int = Field(8, ge=0, description="outstanding requests per copy that make a model hot")
    hot_rps_per_copy: float = Field(0.0, ge=0, description="requests/s per copy that make a model hot; 0 = off")
    pending_ttl_s: float = Field(30.0, gt=0, description="a load this router started counts as LOADING this long")

    def placement(self) -> PlacementConfig:
        return PlacementConfig(hot_queue_depth=self.hot_queue_depth, hot_rps_per_copy=self.hot_rps_per_copy,
                               pending_ttl_s=self.pending_ttl_s)
