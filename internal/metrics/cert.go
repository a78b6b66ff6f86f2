package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CertExpiry gives when a daemon's certificates expire: its own (the
// one in use, which a reload may have replaced) and the cluster CA's.
type CertExpiry func() (node, ca time.Time)

// certDef is the family both daemons expose their certificates' expiry
// under: an alert fires 30 days before (deploy/prometheus).
var certDef = Def{"cairn_cert_expiry_timestamp_seconds", "gauge",
	"When a certificate of the daemon expires (Unix time): its own (cert=\"node\", as in use: a renewal shows once reloaded) and the cluster CA's (cert=\"ca\").",
	[]string{"cert"}}

// certCollector exposes a CertExpiry read at every scrape.
type certCollector struct {
	desc   *prometheus.Desc
	expiry CertExpiry
}

func newCertCollector(expiry CertExpiry, constLabels prometheus.Labels) certCollector {
	return certCollector{prometheus.NewDesc(certDef.Name, certDef.Help, certDef.Labels, constLabels), expiry}
}

func (c certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c certCollector) Collect(ch chan<- prometheus.Metric) {
	node, ca := c.expiry()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(node.Unix()), "node")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(ca.Unix()), "ca")
}
