// A realistic corporate PAC file (20 branches), used by the benchmarks and tests.
// It does no DNS: address tests only run on IP literals, as well-behaved PAC files do.
function FindProxyForURL(url, host) {
    host = host.toLowerCase();
    var isIP = /^\d+\.\d+\.\d+\.\d+$/.test(host);

    // 1-2: plain names and localhost stay inside.
    if (isPlainHostName(host)) return "DIRECT";
    if (host == "localhost" || shExpMatch(host, "*.localhost")) return "DIRECT";

    // 3-5: private address space, when the destination is an IP literal.
    if (isIP && (isInNet(host, "10.0.0.0", "255.0.0.0") ||
                 isInNet(host, "172.16.0.0", "255.240.0.0") ||
                 isInNet(host, "192.168.0.0", "255.255.0.0"))) return "DIRECT";
    if (isIP && isInNet(host, "127.0.0.0", "255.0.0.0")) return "DIRECT";
    if (isIP && isInNet(host, "100.64.0.0", "255.192.0.0")) return "PROXY cluster";

    // 6-9: the company's own domains.
    if (dnsDomainIs(host, ".corp.example.com") || host == "corp.example.com") return "DIRECT";
    if (dnsDomainIs(host, ".intranet.example.com")) return "DIRECT";
    if (localHostOrDomainIs(host, "wiki.example.com")) return "DIRECT";
    if (shExpMatch(host, "*.svc.cluster.local")) return "CLUSTER";

    // 10-12: blocked categories.
    if (shExpMatch(host, "*.ads.*") || shExpMatch(host, "ads.*")) return "BLOCK";
    if (dnsDomainIs(host, ".doubleclick.net") || dnsDomainIs(host, ".tracker.example")) return "DENY";
    if (shExpMatch(url, "*://*.(torrent|warez).*")) return "BLOCK";

    // 13-15: partners through the gateway.
    if (dnsDomainIs(host, ".partner-a.example") || dnsDomainIs(host, ".partner-b.example")) return "GATEWAY";
    if (shExpMatch(host, "api[0-9].payments.example")) return "PROXY gateway";
    if (dnsDomainLevels(host) > 6) return "GATEWAY";

    // 16-18: SaaS through dedicated proxies.
    if (shExpMatch(host, "*.salesforce.com") || shExpMatch(host, "*.force.com")) return "PROXY sfdc-proxy.corp.example.com:8080; DIRECT";
    if (dnsDomainIs(host, ".office365.com") || dnsDomainIs(host, ".sharepoint.com")) return "HTTPS o365-proxy.corp.example.com:8443";
    if (shExpMatch(host, "*.github.com") || host == "github.com") return "SOCKS5 dev-socks.corp.example.com:1080";

    // 19: office hours for the update mirror.
    if (shExpMatch(host, "updates.*") && timeRange(8, 18)) return "PROXY updates-proxy.corp.example.com:3128";

    // 20: everything else through the main proxy, client side.
    return "PROXY proxy.corp.example.com:3128; PROXY proxy2.corp.example.com:3128; DIRECT";
}
