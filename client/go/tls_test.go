package raftlock

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type testCert struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

// issue makes a certificate for cn (and the loopback address), signed by
// ca (self-signed, and a CA, when ca is nil).
func issue(t *testing.T, cn string, ca *testCert) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	parent, signer := tmpl, key
	if ca == nil {
		tmpl.IsCA = true
		tmpl.BasicConstraintsValid = true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &testCert{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}),
	}
}

// Over mutual TLS: https endpoints and Options.HTTPClient with the CA and
// a client certificate; a client without a certificate is refused, and
// the error says why.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := issue(t, "raftlock go test CA", nil)
	node := issue(t, "raftlock node", ca)
	files := map[string][]byte{"ca.pem": ca.certPEM, "node.pem": node.certPEM, "node.key": node.keyPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	app := issue(t, "app", ca)
	appCert, err := tls.X509KeyPair(app.certPEM, app.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{appCert}}}}
	cl, err := startClusterWith("https", withCert, 3,
		"--tls-cert", filepath.Join(dir, "node.pem"),
		"--tls-key", filepath.Join(dir, "node.key"),
		"--tls-ca", filepath.Join(dir, "ca.pem"),
		"--tls-client-auth")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()

	c := newClient(t, cl.endpoints(), Options{HTTPClient: withCert})
	ctx := ctxFor(t, 20*time.Second)
	g, err := c.Acquire(ctx, key(t), AcquireOptions{})
	if err != nil {
		t.Fatalf("over mTLS: %v", err)
	}
	if !strings.HasPrefix(c.currentLeader(), "https://") {
		t.Fatalf("the leader %q is not reached over https", c.currentLeader())
	}
	g.Release()

	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	refused := newClient(t, cl.endpoints(), Options{HTTPClient: noCert, RetryTimeout: time.Second})
	ok, release, err := refused.TryLock(ctx, key(t))
	if ok || !IsCode(err, "UNAVAILABLE") || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without a client certificate: %v %v, want UNAVAILABLE naming the certificate", ok, err)
	}
	t.Logf("without a client certificate: %v", err)
	release()
}
