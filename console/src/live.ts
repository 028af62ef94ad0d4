// Following a server stream from a page: started when the page shows,
// aborted when it goes, and started again (after a pause that grows to
// 10 s) when the stream breaks — a server restart, a replica going away —
// so a page left open stays live.
import { useEffect, useState } from "react";

import { describe, isAbort } from "./api";

export function useStream<T>(
  open: (signal: AbortSignal) => AsyncIterable<T>,
  onMessage: (message: T) => void,
  deps: unknown[],
): string | undefined {
  const [error, setError] = useState<string>();
  useEffect(() => {
    const abort = new AbortController();
    let pause = 500;
    (async () => {
      while (!abort.signal.aborted) {
        try {
          for await (const message of open(abort.signal)) {
            setError(undefined);
            pause = 500;
            onMessage(message);
          }
        } catch (err) {
          if (abort.signal.aborted || isAbort(err)) return;
          setError(describe(err));
        }
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(pause * 2, 10_000);
      }
    })();
    return () => abort.abort();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
  return error;
}

/** The time now, moving every second: for "5s ago" that stays true. */
export function useNow(): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(t);
  }, []);
  return now;
}
