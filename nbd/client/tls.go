package client

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// LoadTLSConfig builds a client TLS configuration from PEM files: caFile holds the CAs that
// sign the server's certificate (empty: the system's CAs), certFile and keyFile a client
// certificate for servers that require one (mutual TLS; both or neither). serverName is the
// name the server's certificate must carry; empty lets Dial take it from the URI. TLS 1.2 is
// the oldest version accepted.
func LoadTLSConfig(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("client: TLS CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client: TLS CA file %s: no PEM certificate in it", caFile)
		}
		conf.RootCAs = pool
	}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client: TLS client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, fmt.Errorf("client: TLS client certificate and key go together (got only one)")
	}
	return conf, nil
}
