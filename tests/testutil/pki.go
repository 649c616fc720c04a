package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a throwaway CA with a server certificate for 127.0.0.1/localhost and
// client certificates on demand, written as PEM files.
type PKI struct {
	t      testing.TB
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CAFile string
	Cert   string
	Key    string
}

// NewPKI makes a CA and a server certificate (kl-relayd, localhost, 127.0.0.1, ::1) in a
// temporary directory of the test.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	k := &PKI{t: t, dir: t.TempDir()}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kl test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	k.ca, _ = x509.ParseCertificate(der)
	k.caKey = key
	k.CAFile = k.write("ca.pem", "CERTIFICATE", der)
	k.Cert, k.Key = k.Issue("kl-relayd", true, "localhost", "127.0.0.1", "::1")
	return k
}

func (k *PKI) write(name, typ string, der []byte) string {
	p := filepath.Join(k.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		k.t.Fatal(err)
	}
	return p
}

// Issue signs a certificate for cn (server or client use) with the given names and
// returns the certificate and key files.
func (k *PKI) Issue(cn string, server bool, names ...string) (cert, key string) {
	priv, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, k.ca, &priv.PublicKey, k.caKey)
	if err != nil {
		k.t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(priv)
	return k.write(cn+".pem", "CERTIFICATE", der), k.write(cn+".key", "EC PRIVATE KEY", kd)
}
