// Starts the live stream the page will ask for first — the fleet page's
// WatchAgents, the queue page's WatchQueue — while the browser is still
// loading and parsing the page's script, so the server's first listing
// (counting and explaining a large queue takes it a few hundred
// milliseconds) is worked out in the same time. The request is the very
// one the page sends: the same gRPC-Web frame, this tab's namespace and
// token. src/api.ts takes the response over when the page's first call is
// that same request; otherwise, or when nothing takes it within 10 s, it
// is aborted. A plain script (no module), so it runs before the page's.
(function () {
  var streams = {
    "/": "/switchyard.v1.AgentAdminService/WatchAgents",
    "/queue": "/switchyard.v1.TaskService/WatchQueue",
  };
  var method = streams[window.location.pathname];
  // The fleet page narrows by a selector typed in the page, never by the
  // address; a query string means some other request, so nothing starts.
  if (!method || window.location.search || !window.fetch || !window.AbortController) return;
  var ns, token;
  try {
    ns = sessionStorage.getItem("switchyard.namespace") || "default";
    token = sessionStorage.getItem("switchyard.token") || "";
  } catch (e) {
    return;
  }
  // The request message: field 1 (namespace), length-delimited.
  var name = new TextEncoder().encode(ns);
  var message = [0x0a];
  for (var n = name.length; n >= 0x80; n >>>= 7) message.push((n & 0x7f) | 0x80);
  message.push(n);
  for (var i = 0; i < name.length; i++) message.push(name[i]);
  // The gRPC-Web envelope: flags 0, then the length big-endian.
  var len = message.length;
  var body = new Uint8Array(5 + len);
  body.set([0, (len >>> 24) & 0xff, (len >>> 16) & 0xff, (len >>> 8) & 0xff, len & 0xff], 0);
  body.set(message, 5);
  var headers = {
    "content-type": "application/grpc-web+proto",
    "x-grpc-web": "1",
    "x-user-agent": "connect-es/2.1.2",
  };
  var authorization = token ? "Bearer " + token : "";
  if (authorization) headers.authorization = authorization;
  var abort = new AbortController();
  var early = {
    url: window.location.origin + method,
    body: body,
    authorization: authorization,
    abort: function () {
      abort.abort();
    },
    taken: false,
    response: window
      .fetch(window.location.origin + method, {
        method: "POST",
        headers: headers,
        body: body,
        redirect: "error",
        signal: abort.signal,
      }),
  };
  // Unhandled only until taken: the page's own call reports any failure.
  early.response.catch(function () {});
  window.__switchyardEarly = early;
  setTimeout(function () {
    if (!early.taken) {
      early.taken = true;
      abort.abort();
    }
  }, 10000);
})();
