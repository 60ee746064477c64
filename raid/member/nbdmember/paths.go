package nbdmember

import (
	"net/url"
	"slices"
	"strings"
)

// pathKeys are the query keys of a member URI whose values are local paths: the unix socket
// and libnbd's directory of TLS files.
var pathKeys = []string{"socket", "tls-certificates"}

// mapPaths returns spec with the value of every socket= and tls-certificates= query key
// replaced by f(value), all else as written (member.Kind.MapPath): a relative socket or
// certificate directory is taken from the working directory on the command line and from
// the file's directory in a configuration file, as a member file's path is. A value f leaves
// unchanged is not rewritten, so a spec with absolute paths comes back byte for byte.
func mapPaths(spec string, f func(string) (string, error)) (string, error) {
	base, query, ok := strings.Cut(spec, "?")
	if !ok {
		return spec, nil
	}
	params := strings.Split(query, "&")
	for i, kv := range params {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" || !slices.Contains(pathKeys, k) {
			continue
		}
		p, err := url.QueryUnescape(v)
		if err != nil {
			continue // Open reports the malformed query
		}
		mapped, err := f(p)
		if err != nil {
			return "", err
		}
		if mapped != p {
			params[i] = k + "=" + strings.ReplaceAll(url.QueryEscape(mapped), "%2F", "/")
		}
	}
	return base + "?" + strings.Join(params, "&"), nil
}
