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


def test_allow_http_reaches_the_client_of_every_store_kind():
    for url, opts in (("gs://bkt/p", {}), ("az://ctr/p", {"account_name": "acct"})):
        b = open_backend(url, allow_http="true", **opts)
        assert b._store.client_options["allow_http"] == "true", url
        assert "allow_http" not in b._store.config, url  # a client option, not a store key
        b.close()


def test_a_range_at_or_past_the_end_is_empty_where_the_store_answers_no_416(monkeypatch):
    """Azure Blob Storage (Azurite checked) answers a range past the end with the whole object and
    object_store then raises "Wanted range starting at N, but object was only N bytes long", with no
    HTTP status: it must read as the end of the file, not as a transient failure retried into EIO.
    obstore's memory store raises the same error, so it stands in for the store here."""
    import obstore
    from obstore.store import MemoryStore

    from shadefs.backends.obstore import ObstoreBackend, obstore_transient

    monkeypatch.setattr(ObstoreBackend, "_make_store", lambda self, kind, options, client: MemoryStore())
    b = open_backend("az://ctr/ds", account_name="acct", retries="2", retry_base_s="0.01", retry_max_s="0.02")
    obstore.put(b._store, "ds/a.bin", b"0123456789")
    assert b.read_range("a.bin", 10, 5) == b""
    assert b.read_range("a.bin", 12, 5) == b""
    assert b.read_range("a.bin", 5, 30) == b"56789"
    with pytest.raises(obstore.exceptions.GenericError) as e:
        obstore.get(b._store, "ds/a.bin", options={"range": (10, 20)})
    assert obstore_transient(e.value) is False
    b.close()


def test_deadline_bounds_each_attempt_to_half_of_it():
    b = open_backend("s3://bkt/p", region="us-east-1", timeout_s="60", deadline_s="4")
    assert b.bounds_own_reads and b.deadline_s == 4.0
    assert b._store.client_options == {"pool_max_idle_per_host": "64", "connect_timeout": "2.0s",
                                       "read_timeout": "2.0s", "timeout": "2.0s"}
    b.close()


def test_each_option_reaches_only_the_component_that_takes_it():
    """The fsspec lister gets s3fs's options in s3fs's spelling; allow_http and obstore's own store keys
    stay with obstore (s3fs failed the listing on them: an unexpected keyword argument)."""
    from shadefs.backends.obstore import lister_options

    given = {"endpoint_url": "http://127.0.0.1:9", "allow_http": "true", "virtual_hosted_style_request": "false",
             "access_key_id": "AKID", "secret": "s", "pool_connections": "16", "client_kwargs.region_name": "r",
             "connect_timeout": "3"}
    assert lister_options("s3", given) == {"endpoint_url": "http://127.0.0.1:9", "key": "AKID", "secret": "s",
                                           "pool_connections": "16", "client_kwargs.region_name": "r",
                                           "connect_timeout": "3"}
    assert lister_options("gcs", {"service_account_path": "/sa.json", "allow_http": "true"}) == {
        "token": "/sa.json"}
    assert lister_options("azure", {"account_name": "acct", "allow_http": "true"}) == {"account_name": "acct"}
