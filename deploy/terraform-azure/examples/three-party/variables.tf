variable "name_prefix" {
  type        = string
  description = "Prefix of every resource name."
}

variable "location" {
  type        = string
  description = "Azure region."
}

variable "resource_group_name" {
  type        = string
  description = "Existing resource group."
}

variable "party_count" {
  type        = number
  description = "3 or 4."
}

variable "security" {
  type        = string
  description = "passive-3pc, active-3pc or active-4pc."
}

variable "allowed_https_cidrs" {
  type        = list(string)
  description = "Client networks allowed to reach the gateway."
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "Administration networks (may be empty)."
  default     = []
}

variable "admin_ssh_public_key" {
  type        = string
  description = "OpenSSH public key of the administrator."
}

variable "party_admin_ssh_public_keys" {
  type        = map(string)
  description = "OpenSSH public key of each party's own administrator, by party name (optional)."
  default     = {}
}

variable "party_image" {
  type        = string
  description = "Party image reference."
}

variable "gateway_image" {
  type        = string
  description = "Gateway image reference."
}

variable "acr_id" {
  type        = string
  description = "Container registry resource ID, or null."
  default     = null
}

variable "key_vault_id" {
  type        = string
  description = "Key Vault holding one secret per VM."
}
