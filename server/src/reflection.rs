//! Server reflection (v1, and v1alpha for grpcurl 1.8) as `--reflection`
//! chooses: `public` answers everyone, `authenticated` (the default) only
//! callers with a valid token of any role while tokens are configured (an
//! open server answers everyone, as it answers every RPC), `off` serves
//! none. Reflection shows the contract, never data; it is guarded so an
//! unauthenticated scanner learns nothing of what the server is.

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

use crate::auth::Tokens;

/// Who may use server reflection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Reflection {
    /// Anyone.
    Public,
    /// Callers with a valid token (anyone while the server is open).
    #[default]
    Authenticated,
    /// Nobody: reflection is not served.
    Off,
}

/// A reflection service behind the token check.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    tokens: Tokens,
}

impl<S> Guarded<S> {
    /// `inner`, answering only callers `tokens` accepts.
    pub fn new(inner: S, tokens: Tokens) -> Self {
        Self { inner, tokens }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for Guarded<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone takes the call; the polled-ready one stays for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let tokens = self.tokens.clone();
        Box::pin(async move {
            let header = request
                .headers()
                .get("authorization")
                .map(|h| h.to_str().unwrap_or_default());
            match tokens.caller(header).await {
                Ok(_) => inner.call(request).await,
                Err(err) => Ok(tonic::Status::from(err).into_http()),
            }
        })
    }
}
