//! Kubernetes authentication of the `/ui` page, the way kube-rbac-proxy
//! guards an endpoint: the request's bearer token goes to the API server in a
//! TokenReview, and what its user may list to SubjectAccessReviews; the view
//! is then restricted to that ([`crate::status::access`]). Answers are cached
//! for a short time, and at most [`REVIEWS_IN_FLIGHT`] requests ask the API
//! server at once: the others are told to come back (429), so a flood of
//! tokens cannot turn into a flood of reviews.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::{Client, Resource};
use tokio::sync::{Mutex, Semaphore};

use crate::api::TrainingJob;
use crate::status::access::Access;

/// Requests that may be waiting for the API server's reviews at once.
pub const REVIEWS_IN_FLIGHT: usize = 8;
/// How long a token's review is trusted.
const TOKEN_TTL: Duration = Duration::from_secs(30);
/// How long a refused token stays refused without asking again.
const REFUSED_TTL: Duration = Duration::from_secs(10);
/// How long an access decision is trusted.
const DECISION_TTL: Duration = Duration::from_secs(30);
/// Entries each cache holds at most.
const CACHE_ENTRIES: usize = 4096;
/// The bound of one review call.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Namespace reviews of one request in flight together.
const NAMESPACE_REVIEWS: usize = 8;

/// Why a request is not served.
#[derive(Debug, PartialEq, Eq)]
pub enum Denial {
    /// No bearer token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// Authenticated, but may list neither TrainingJobs nor GpuNodes (403).
    Forbidden(String),
    /// Too many requests are waiting for reviews (429).
    Busy,
    /// The API server did not answer a review (502).
    Api(String),
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A map whose entries expire; when full, the expired ones go, and if it is
/// still full, all of them (a cache, not a record).
pub struct TtlCache<K, V> {
    entries: HashMap<K, (Instant, V)>,
    capacity: usize,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        TtlCache {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// The value of `key` unless it expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(until, _)| now < *until)
            .map(|(_, v)| v.clone())
    }

    /// Keeps `value` for `ttl` from `now`.
    pub fn put(&mut self, key: K, value: V, now: Instant, ttl: Duration) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (until, _)| now < *until);
            if self.entries.len() >= self.capacity {
                self.entries.clear();
            }
        }
        self.entries.insert(key, (now + ttl, value));
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What is asked of the authorizer: `list` of `resource` in `namespace`
/// (empty: every namespace, or a cluster-scoped resource).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Question {
    user: String,
    resource: &'static str,
    namespace: String,
}

/// Reviews tokens and access against the API server, with caches.
pub struct Reviewer {
    client: Client,
    audiences: Vec<String>,
    tokens: Mutex<TtlCache<String, Result<UserInfo, String>>>,
    decisions: Mutex<TtlCache<Question, bool>>,
    in_flight: Semaphore,
}

impl Reviewer {
    /// A reviewer asking through `client`; `audiences` are the token
    /// audiences accepted (empty: the API server's own).
    pub fn new(client: Client, audiences: Vec<String>) -> Self {
        Reviewer {
            client,
            audiences,
            tokens: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            decisions: Mutex::new(TtlCache::new(CACHE_ENTRIES)),
            in_flight: Semaphore::new(REVIEWS_IN_FLIGHT),
        }
    }

    /// What the bearer of `header` may see, asking about each of
    /// `namespaces` (those with jobs) unless they may list TrainingJobs
    /// everywhere.
    pub async fn authorize(
        &self,
        header: Option<&str>,
        namespaces: Vec<String>,
    ) -> Result<Access, Denial> {
        let token = bearer(header).ok_or_else(|| {
            Denial::Unauthenticated("an Authorization: Bearer <token> header is needed".into())
        })?;
        let _permit = self.in_flight.try_acquire().map_err(|_| Denial::Busy)?;
        let user = self.user(token).await?;
        let key = serde_json::to_string(&user).unwrap_or_default();
        let ask = |resource: &'static str, namespace: String| Question {
            user: key.clone(),
            resource,
            namespace,
        };
        let all = self.may(&user, ask("trainingjobs", String::new())).await?;
        let gpu_nodes = self.may(&user, ask("gpunodes", String::new())).await?;
        let mut answers = Vec::new();
        if !all {
            let mut asked = futures::stream::iter(namespaces)
                .map(|ns| async {
                    let allowed = self.may(&user, ask("trainingjobs", ns.clone())).await;
                    allowed.map(|a| (ns, a))
                })
                .buffer_unordered(NAMESPACE_REVIEWS);
            while let Some(answer) = asked.next().await {
                answers.push(answer?);
            }
        }
        Access::from_reviews(all, answers, gpu_nodes).ok_or_else(|| {
            Denial::Forbidden(format!(
                "{} may list neither TrainingJobs (in any namespace with jobs) nor GpuNodes",
                user.username.as_deref().unwrap_or("this user")
            ))
        })
    }

    /// The user of `token`, from the cache or a TokenReview.
    async fn user(&self, token: &str) -> Result<UserInfo, Denial> {
        let now = Instant::now();
        let known = self.tokens.lock().await.get(&token.to_string(), now);
        let answer = match known {
            Some(answer) => answer,
            None => {
                let answer = self.review_token(token).await?;
                let ttl = if answer.is_ok() {
                    TOKEN_TTL
                } else {
                    REFUSED_TTL
                };
                self.tokens
                    .lock()
                    .await
                    .put(token.to_string(), answer.clone(), now, ttl);
                answer
            }
        };
        answer.map_err(Denial::Unauthenticated)
    }

    async fn review_token(&self, token: &str) -> Result<Result<UserInfo, String>, Denial> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: (!self.audiences.is_empty()).then(|| self.audiences.clone()),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| Denial::Api("the TokenReview timed out".into()))?
                .map_err(|e| Denial::Api(format!("TokenReview: {e}")))?;
        let status = answer.status.unwrap_or_default();
        Ok(match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Ok(user),
            _ => Err(status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "the token is not valid".into())),
        })
    }

    /// May `user` list what `question` names; from the cache or a
    /// SubjectAccessReview.
    async fn may(&self, user: &UserInfo, question: Question) -> Result<bool, Denial> {
        let now = Instant::now();
        if let Some(allowed) = self.decisions.lock().await.get(&question, now) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(<TrainingJob as Resource>::group(&()).into_owned()),
                    resource: Some(question.resource.to_string()),
                    verb: Some("list".into()),
                    namespace: (!question.namespace.is_empty()).then(|| question.namespace.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| Denial::Api("the SubjectAccessReview timed out".into()))?
                .map_err(|e| Denial::Api(format!("SubjectAccessReview: {e}")))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        self.decisions
            .lock()
            .await
            .put(question, allowed, now, DECISION_TTL);
        Ok(allowed)
    }
}

#[cfg(test)]
#[path = "ui_auth_tests.rs"]
mod tests;
