Rails.application.routes.draw do
  resources :posts
  resources :documents, only: %i[ new create destroy ]
  get "stream" => "streams#show"
  get "download" => "downloads#show"
  get "download/info" => "downloads#info"
  get "plain" => "pages#plain"
  get "db" => "pages#db"
  get "cpu" => "pages#cpu"
  get "slow" => "pages#slow"
  resources :jobs, only: %i[ create show ], param: :token

  # 200 when the app booted (load balancers, bench/run's readiness check)
  get "up" => "rails/health#show", as: :rails_health_check

  root "posts#index"
end
