// Command refwebhook is the benchmark's reference mutating webhook: the least a webhook can do
// for a pod create. It answers every AdmissionReview on /mutate with the one JSON patch it was
// given (gpuplace's own patch for the benchmark's pods), so the apiserver does the same work as
// with gpuplace's webhook, and the server's own share is Go's net/http over TLS and one JSON
// decode and encode. HTTP/1.1 only, as gpuplace's webhook serves.
package main

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
)

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType"`
	Patch     string `json:"patch"`
}

type answer struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Response   response `json:"response"`
}

const maxBody = 3 << 20

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	certFile := flag.String("tls-cert-file", "", "serving certificate (PEM)")
	keyFile := flag.String("tls-key-file", "", "its key (PEM)")
	patchFile := flag.String("patch-file", "", "the JSON patch every review is answered with")
	flag.Parse()

	patch, err := os.ReadFile(*patchFile)
	if err != nil {
		log.Fatalf("reading the patch: %v", err)
	}
	var ops []map[string]any
	if err := json.Unmarshal(patch, &ops); err != nil {
		log.Fatalf("%s is not a JSON patch: %v", *patchFile, err)
	}
	encoded := base64.StdEncoding.EncodeToString(patch)
	var reviews atomic.Int64

	mux := http.NewServeMux()
	mux.HandleFunc("POST /mutate", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil || len(body) > maxBody {
			http.Error(w, "the body could not be read or is too large", http.StatusBadRequest)
			return
		}
		var in review
		if err := json.Unmarshal(body, &in); err != nil || in.Request == nil || in.Request.UID == "" {
			http.Error(w, "not an AdmissionReview with request.uid", http.StatusBadRequest)
			return
		}
		out, _ := json.Marshal(answer{
			APIVersion: in.APIVersion,
			Kind:       in.Kind,
			Response:   response{UID: in.Request.UID, Allowed: true, PatchType: "JSONPatch", Patch: encoded},
		})
		reviews.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	})
	mux.HandleFunc("GET /reviews", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, strconv.FormatInt(reviews.Load(), 10))
	})

	pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("loading the serving certificate: %v", err)
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("listening: %v", err)
	}
	server := &http.Server{
		Handler:   mux,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
		// A non-nil empty map turns HTTP/2 off: HTTP/1.1, as gpuplace's webhook serves.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	fmt.Println(listener.Addr().(*net.TCPAddr).Port)
	log.Fatal(server.ServeTLS(listener, "", ""))
}
