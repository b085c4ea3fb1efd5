#!/usr/bin/env python3
"""mkcert.py PREFIX NOT_BEFORE NOT_AFTER: a self-signed P-256 certificate for localhost and
127.0.0.1 valid between the two ISO dates, written as PREFIX.crt and PREFIX.key."""
import datetime, ipaddress, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

prefix, nb, na = sys.argv[1:4]
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(datetime.datetime.fromisoformat(nb).replace(tzinfo=datetime.timezone.utc))
        .not_valid_after(datetime.datetime.fromisoformat(na).replace(tzinfo=datetime.timezone.utc))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256()))
open(prefix + ".crt", "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open(prefix + ".key", "wb").write(key.private_bytes(serialization.Encoding.PEM,
     serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
