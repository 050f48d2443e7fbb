"""How a store failure is told: the store's code and message, a refused connection, a
timeout; a secret in the client's text never comes through."""

from __future__ import annotations

from sluice.repository.remote.stores import describe_error

NO_BUCKET = (
    "Generic S3 error: Error performing list request: Error performing GET "
    "http://127.0.0.1:1/b?list-type=2 in 3ms - Server returned non-2xx status code: 404 Not "
    'Found: <?xml version="1.0"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket '
    "does not exist</Message><RequestId>x</RequestId></Error>\n\nDebug source: ..."
)


def test_store_code_and_message() -> None:
    assert describe_error(Exception(NO_BUCKET), []) == (
        "NoSuchBucket: The specified bucket does not exist"
    )


def test_connection_refused_and_unreachable() -> None:
    refused = (
        "HTTP error: error sending request ... tcp connect error: Connection refused (os error 111)"
    )
    assert describe_error(Exception(refused), []).startswith("connection refused")
    dns = "HTTP error: error sending request ... dns error: failed to lookup address"
    assert describe_error(Exception(dns), []) == "cannot resolve the store's host name"


def test_status_without_a_body_and_secrets_scrubbed() -> None:
    text = "Server returned non-2xx status code: 403 Forbidden: token=Sekr3t-Value"
    assert describe_error(Exception(text), ["Sekr3t-Value"]) == "the store answered 403 Forbidden"
    other = "weird failure mentioning Sekr3t-Value twice: Sekr3t-Value"
    out = describe_error(Exception(other), ["Sekr3t-Value"])
    assert "Sekr3t-Value" not in out and "***" in out


def test_a_failed_token_request_names_the_token_endpoint_not_the_store() -> None:
    text = (
        "Generic GCS error: Error performing token request: Error performing POST "
        "https://accounts.google.com/o/oauth2/token in 1.3ms - HTTP error: error sending "
        'request\n ... ConnectError(\n "dns error", ...'
    )
    assert describe_error(Exception(text), []) == (
        "cannot get an access token from https://accounts.google.com/o/oauth2/token: "
        "cannot resolve the token endpoint's host name"
    )


def test_an_untrusted_certificate_says_how_to_trust_it() -> None:
    text = (
        "Generic S3 error: Error performing list request: ... HTTP error: error sending "
        "request\n ... error: InvalidCertificate(\n    UnknownIssuer,\n ),"
    )
    assert describe_error(Exception(text), []) == (
        "the store's TLS certificate is not trusted (UnknownIssuer): name its CA in SSL_CERT_FILE"
    )


def test_a_client_message_loses_the_clients_prefix() -> None:
    text = "Generic GCS error: Unable to decode service account file: EOF while parsing"
    assert describe_error(Exception(text), []) == (
        "Unable to decode service account file: EOF while parsing"
    )
