//===- Facts.cpp - What one unit tells the whole program ------------------===//

#include "Facts.h"

namespace ulplint {

static thread_local UnitFacts *Current = nullptr;

UnitFacts *currentFacts() { return Current; }

static ProgramFactsProvider Provider = nullptr;
void setProgramFactsProvider(ProgramFactsProvider P) { Provider = P; }
ProgramFactsProvider programFactsProvider() { return Provider; }

FactScope::FactScope(UnitFacts *Sink) : Saved(Current) { Current = Sink; }
FactScope::~FactScope() { Current = Saved; }

static thread_local SiteSink *CurrentSites = nullptr;
SiteSink *currentSiteSink() { return CurrentSites; }
SiteScope::SiteScope(SiteSink *Sink) : Saved(CurrentSites) {
  CurrentSites = Sink;
}
SiteScope::~SiteScope() { CurrentSites = Saved; }

static llvm::StringRef factVerb(FactKind K) {
  switch (K) {
  case FactKind::Exposes: return "exposes";
  case FactKind::Invalidates: return "invalidates";
  case FactKind::Deregisters: return "deregisters";
  case FactKind::Releases: return "releases";
  case FactKind::Rotates: return "rotates";
  case FactKind::RefusesIwarp: return "refuses-iwarp";
  case FactKind::Posts: return "posts";
  case FactKind::PostsRegistration: return "posts-registration";
  case FactKind::Signals: return "signals";
  case FactKind::ComparesInvalidatedKey: return "compares-invalidated-key";
  case FactKind::TearsDown: return "tears-down";
  case FactKind::GrantsRemoteWrite: return "grants-remote-write";
  case FactKind::LacksRemoteWrite: return "lacks-remote-write";
  case FactKind::PostsRdma: return "posts-rdma";
  case FactKind::PostsOn: return "posts-on";
  case FactKind::SignalsOn: return "signals-on";
  case FactKind::SendQueueCost: return "sq-cost";
  case FactKind::RkeyLeaves: return "rkey-leaves";
  case FactKind::Defines: return "defines";
  case FactKind::Moves: return "moves";
  }
  return "";
}

std::string factKey(FactKind K, llvm::StringRef Subject) {
  return (factVerb(K) + ":" + Subject).str();
}

} // namespace ulplint
