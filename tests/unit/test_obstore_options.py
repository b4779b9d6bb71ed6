"""The obstore backend's options: the fsspec/s3fs spellings land in obstore's store and client config,
timeouts are capped at --backend-timeout, secrets are masked, and a bad option is one clear error."""
import pytest

from conftest import require

require("obstore.store")

from shadefs.backends import BackendError, open_backend  # noqa: E402


def test_s3_options_land_in_the_store_and_client_config():
    b = open_backend("s3://bkt/some/prefix/", endpoint_url="http://127.0.0.1:9", region="eu-west-1",
                     anon="true", max_pool_connections="7", read_timeout="3", timeout_s="2")
    assert b._store.config == {"bucket": "bkt", "endpoint": "http://127.0.0.1:9", "region": "eu-west-1",
                               "skip_signature": "true"}
    assert b._store.client_options == {"allow_http": "true", "pool_max_idle_per_host": "7",
                                       "connect_timeout": "2.0s", "read_timeout": "3.0s"}
    assert b.describe() == "s3://bkt/some/prefix (endpoint http://127.0.0.1:9) via obstore"
    b.close()


def test_backend_timeout_caps_the_per_attempt_timeouts_and_the_daemon_sizes_the_pool():
    b = open_backend("s3://bkt/p", **{"client_kwargs.region_name": "us-east-1"}, timeout_s="1.5",
                     pool_connections="288")
    assert b._store.client_options == {"pool_max_idle_per_host": "288", "connect_timeout": "1.5s",
                                       "read_timeout": "1.5s"}
    assert b._store.config["region"] == "us-east-1"


def test_secrets_are_masked_and_never_described():
    b = open_backend("s3://bkt/p", key="AKIDSHADEFS", secret="s3cr3t-value-42", token="tok-s3cr3t-value-42",
                     requester_pays="true")
    assert b._store.config["secret_access_key"] == "s3cr3t-value-42"
    assert b._store.config["request_payer"] == "true"
    assert "s3cr3t-value-42" not in repr(b.options) and "s3cr3t-value-42" not in b.describe()


def test_gcs_and_azure_urls_build_their_stores():
    assert open_backend("gs://bkt/pre/fix", listing="obstore").describe() == "gs://bkt/pre/fix via obstore"
    assert open_backend("az://container/p", account_name="acct", listing="obstore").kind == "azure"


@pytest.mark.parametrize("url,options,message", [
    ("gs://bkt/p", {"nosuchkey": "x"}, "gs:// rejected the backend options: Configuration key: 'nosuchkey'"),
    ("s3://bkt/p", {"endpoin_url": "http://x"}, "'endpoin_url' is not valid"),
    ("s3://bkt/p", {"retries": "-1"}, "bad retry option"),
    ("s3://bkt/p", {"timeout_s": "soon"}, "timeout_s='soon': expected seconds"),
    ("s3://bkt/p", {"listing": "ls"}, "listing='ls': choose auto, fsspec or obstore"),
    ("s3://", {}, "no bucket"),
])
def test_bad_options_are_one_line_backend_errors(url, options, message):
    with pytest.raises(BackendError) as info:
        open_backend(url, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_other_schemes_are_refused_with_the_fsspec_hint():
    with pytest.raises(BackendError, match=r"not 'memory://x' \(use --backend fsspec\)"):
        open_backend("memory://x", "obstore")
