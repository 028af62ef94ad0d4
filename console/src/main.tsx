// The console's shell: the header (pages, namespace, token) and a small
// router over the History API, so every page has an address of its own
// (`/agents/ID`, `/tasks/ID`) that can be shared and reloaded.
import { StrictMode, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";

import { namespace, setNamespace, setToken, token } from "./api";
import { Link } from "./nav";
import { FleetPage } from "./pages/Fleet";
import { AgentPage } from "./pages/Agent";
import { QueuePage } from "./pages/Queue";
import { TaskPage } from "./pages/Task";
import { WhatIfPage } from "./pages/WhatIf";
import "./style.css";

function usePath(): string {
  const [path, setPath] = useState(window.location.pathname);
  useEffect(() => {
    const on = () => setPath(window.location.pathname);
    window.addEventListener("popstate", on);
    return () => window.removeEventListener("popstate", on);
  }, []);
  return path;
}

function Credentials(props: { onChange: () => void }) {
  const [value, setValue] = useState(token());
  const [ns, setNs] = useState(namespace());
  return (
    <form
      className="credentials"
      onSubmit={(e) => {
        e.preventDefault();
        setToken(value.trim());
        setNamespace(ns.trim());
        props.onChange();
      }}
    >
      <label>
        namespace <input name="namespace" value={ns} onChange={(e) => setNs(e.target.value)} size={10} />
      </label>
      <label>
        token{" "}
        <input
          name="token"
          type="password"
          autoComplete="off"
          value={value}
          onChange={(e) => setValue(e.target.value)}
          placeholder="sy_…"
          size={16}
        />
      </label>
      <button type="submit">use</button>
    </form>
  );
}

function App() {
  const path = usePath();
  // Changing the token or namespace remounts the page, restarting its streams.
  const [session, setSession] = useState(0);
  const parts = path.split("/").filter(Boolean);
  let page: React.ReactNode;
  let tab = "";
  if (parts[0] === "agents" && parts[1]) {
    page = <AgentPage id={decodeURIComponent(parts[1])} />;
    tab = "fleet";
  } else if (parts[0] === "queue") {
    page = <QueuePage />;
    tab = "queue";
  } else if (parts[0] === "tasks" && parts[1]) {
    page = <TaskPage id={decodeURIComponent(parts[1])} />;
    tab = "queue";
  } else if (parts[0] === "what-if") {
    page = <WhatIfPage />;
    tab = "what-if";
  } else {
    page = <FleetPage />;
    tab = "fleet";
  }
  return (
    <>
      <header>
        <span className="brand">Switchyard</span>
        <nav>
          <Link to="/" className={tab === "fleet" ? "active" : ""}>Fleet</Link>
          <Link to="/queue" className={tab === "queue" ? "active" : ""}>Queue</Link>
          <Link to="/what-if" className={tab === "what-if" ? "active" : ""}>What if</Link>
        </nav>
        <Credentials onChange={() => setSession((n) => n + 1)} />
      </header>
      <main key={`${session}:${path}`}>{page}</main>
    </>
  );
}

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <App />
  </StrictMode>,
);
